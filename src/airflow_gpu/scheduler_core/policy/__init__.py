"""When a job starts: the queue policy, the order of pending jobs, the time model,
reservations and the scheduling pass that `plan`, `simulate` and the service share."""
