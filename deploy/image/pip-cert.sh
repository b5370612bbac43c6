# Sourced by the Dockerfile's RUN steps: the build secret `cacert`, when given, is the CA bundle
# pip trusts (a TLS-intercepting proxy's); without it pip uses the image's own CAs.
if [ -s /run/secrets/cacert ]; then
    export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert
fi
