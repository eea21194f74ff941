"""Visual envs, rendered offline (PIL, matplotlib): VisualGrid-v0 (Sokoban over several turns, a new
board image after each move) and ChartQA-v0 (questions over a chart, with a ``zoom`` tool whose result
is an image)."""
