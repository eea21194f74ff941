"""DockerSandbox: each run in a pre-started Docker container, and the private engine and offline image it needs."""
