"""Several coordinator nodes: which node owns which partition (:mod:`.placement`)
and which nodes are alive (:mod:`.registry`)."""
