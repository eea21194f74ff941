# Print 200,000 characters (plus a newline). Expected: all of it, or a prefix with truncated=True.
print("x" * 200_000)
