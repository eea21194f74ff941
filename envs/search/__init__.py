"""Search-v0: questions over the bundled Wikipedia corpus answered with a search tool (Search-R1 style)."""
