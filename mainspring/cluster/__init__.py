"""Compute beyond this process: a Ray cluster (ray_cluster.py), engine replicas as Ray actors behind one
router (engine_replicas.py, prefix_router.py). Ray holds no durable state: what must survive lives in the
database, and a lost actor loses only the work in flight, which its caller retries."""
