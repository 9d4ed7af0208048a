"""Where a partition's records are kept, behind one interface (:mod:`coordinator.store.base`):
the file log (:mod:`coordinator.store.file`) and etcd (:mod:`coordinator.store.etcd`, which needs
the optional etcd client). The shard (coordinator.runtime.shard) is given one of them."""
