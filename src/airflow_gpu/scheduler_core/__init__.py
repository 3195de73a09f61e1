"""Scheduler core: the placement engine and, later, the service around it.

Imports nothing from Airflow, so it runs on hosts without Airflow.
"""
