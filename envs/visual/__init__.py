"""Visual envs, rendered offline (PIL, matplotlib): VisualGrid-v0 (Sokoban over several turns, a new
board image after each move) and ChartQA-v0 (questions over a chart, with a ``zoom`` tool whose result
is an image)."""

try:
    import PIL  # noqa: F401
except ImportError as exc:  # every module here draws with Pillow
    raise ImportError("the visual envs need Pillow and matplotlib: pip install 'chatgym[visual]'") from exc
