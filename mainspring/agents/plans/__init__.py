"""Plans: a goal carried out as a DAG of agent tasks (issue 17). spec.py is the document and its checks,
tables.py the durable state, store.py the durable changes (their rules: transitions.py), scheduler.py and
leader.py the one scheduler, service.py the scoped view the API and CLI use."""
