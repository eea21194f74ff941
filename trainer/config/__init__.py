"""The run config: one frozen dataclass per YAML section, one loader (``loader.py``), checked field by field."""
