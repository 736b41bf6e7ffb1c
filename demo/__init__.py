"""`fabricscope demo`: the whole system end to end on this one machine (demo/cli.py)."""
