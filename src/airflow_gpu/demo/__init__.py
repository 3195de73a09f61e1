"""`airflow-gpu demo` (cli/commands/demo_command.py): run.py runs it end to end,
stack.py starts and stops the processes, story.py tells and checks the story of
demo_dags/gpu_story.py, timeline.py draws it; dagtest.py runs one DAG with `dag.test()`."""
