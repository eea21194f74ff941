"""The SandboxFusion HTTP API: its wire format, a client backend for any such service, and our own service."""
