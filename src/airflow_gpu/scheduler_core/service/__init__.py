"""The scheduler-core service: the store-backed core, the REST API and the scheduling loop."""
