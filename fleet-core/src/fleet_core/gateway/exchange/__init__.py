"""The exchange with engines: one request served from admission to settlement (``service``),
routing it to a replica (``routing``, ``router``), opening the upstream with failover (``proxy``),
relaying the answer frame by frame (``relay``), and keeping the engine list current (``health``,
``discovery``, ``tokenizers``)."""
