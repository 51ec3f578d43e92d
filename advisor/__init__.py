"""The advisor: the command line, the strategy search, and DeepSpeed config output.

Nothing here imports torch or DeepSpeed at module level; `advisor predict` and
`advisor recommend` run on a laptop from a shipped profile.
"""

__version__ = "0.1.0"
