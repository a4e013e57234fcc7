"""The GPU-node energy agent: the server that runs beside vLLM on a GPU host and attributes its joules to
requests (:mod:`.server`, ``energy-router agent``), its bounded request parsing (:mod:`.api`), its TLS
(:mod:`.tls`), and the proxy-side meter that asks it (:mod:`.client`, ``energy.meter: agent``)."""
