"""Several coordinator nodes (issue 12): which node owns which partition (:mod:`.placement`)
and which nodes are alive (:mod:`.registry`)."""
