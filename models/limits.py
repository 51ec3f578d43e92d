"""The largest values the advisor takes, for the command line, model configs, DeepSpeed configs and
run records alike: beyond them no training run exists, and the cost model's integer products
(parameters x tokens x GPUs) would leave int64, where numpy wraps around or gives up.

Importing this module costs nothing (the CLI reads it before numpy).
"""

MAX_SEQ = 2**24  # tokens of context: 16M
MAX_TOKENS = 10**18  # tokens of a whole run
MAX_SEQUENCES = 10**12  # sequences of one optimizer step
MAX_GPUS = 2**20
MAX_GPUS_PER_NODE = 1024  # the largest NVLink domains hold 72-576
MAX_COUNT = 2**20  # sp, micro-batch, accumulation: their products with the GPUs stay inside int64
MAX_PER_SAMPLE = 2**16  # images or frames per sample, pixels a side, CPU threads per rank
MAX_BUCKET_ELEMENTS = 2**40  # DeepSpeed's reduce / all-gather / prefetch buckets

# Model configs: a trained decoder is at most some 10^4 wide and 10^2 layers deep today.
MAX_WIDTH = 2**20  # hidden, FFN and head widths
MAX_VOCAB = 2**24
MAX_LAYERS = 2**14
MAX_HEADS = 2**14
MAX_PARAMS = 10**14  # a hundred trillion parameters
