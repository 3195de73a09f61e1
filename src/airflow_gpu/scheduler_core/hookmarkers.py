"""The pluggy markers of the `airflow_gpu` plugin hooks (plugins.py declares the hooks).

Apart from plugins.py so that the built-in plugins (jobclasses, healthscore) mark their
hooks without importing the module that registers them."""

import pluggy

PROJECT = "airflow_gpu"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
