"""Jinja2 templates and the report schema, installed as the package `triage.templates`."""
