"""The gateway's HTTP edge: the OpenAI routes, the request and response types they decode, the
outermost ASGI dispatch, who may read fleet-wide data, and racing an answer against a client
that leaves. No routing, admission or metering decisions live here."""
