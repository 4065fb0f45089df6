"""Plans: a goal carried out as a DAG of agent tasks (issue 17). spec.py is the document and its checks,
tables.py the durable state, store.py the transitions; the scheduler and the API build on these."""
