"""Every limit a model file is checked against, in one table (docs/validation.md).

Sizes are far above any published model (the largest hidden size is 16,384, the
largest vocabulary about 262k, the most layers 126) and far below what would
make an integer product, a Python loop or a JSON file take minutes: the size
arithmetic (``ir/sizes.py``) then rejects what fits the bounds but not the
hardware. Float ranges are what the maths needs: finite, positive where a zero
or a sign flip means a different model, and away from underflow.
"""

from __future__ import annotations

# Integer sizes (inclusive upper bounds).
MAX_WIDTH = 2**20          # hidden, intermediate, projection widths, tensor dims
MAX_VOCAB = 2**22          # vocabulary rows
MAX_LAYERS = 1024          # decoder layers of a model
MAX_HEADS = 1024           # query or key/value heads
MAX_HEAD_DIM = 1024        # features per head
MAX_EXPERTS = 4096         # routed experts of a MoE block
MAX_SHARED_EXPERTS = 64    # always-on experts of a MoE block
MAX_CONV_KERNEL = 64       # taps of a short causal convolution (4 in published GDN models)
MAX_SEQ_LEN = 2**24        # KV-cache positions, windows, rope's original context
MAX_LAYER_DEFS = 512       # distinct layers written in an IR file
MAX_NODES = 256            # ops in one layer
MAX_TENSORS = 512          # tensors declared in one layer

# Float ranges: (low, high); a bound is inclusive unless said otherwise.
NORM_EPS = (1e-12, 0.1)            # smaller underflows to 0 in f32 sums; HF uses 1e-5..1e-6
ROPE_THETA = (1.0, 1e12)           # exclusive low: theta 1 makes every frequency 1
SOFTMAX_SCALE = (0.0, 1e3)         # 0 means 1/sqrt(head_dim)
ROUTED_SCALING = (0.0, 1e3)        # exclusive low: 0 switches the routed experts off
RENORMALIZE_EPS = (0.0, 1e-3)      # added to the top-k weights' sum (Muse Spark 1e-15)
MAX_SCALE = 1e6                    # |factor| of a scale op, the cap of a softcap
ROPE_FACTOR = (0.0, 1e4)           # exclusive low
ROPE_FREQ_FACTOR = (0.0, 1e4)      # low/high_freq_factor of llama3 scaling, exclusive low

# Names.
MAX_NAME_CHARS = 128       # model, layer, op and tensor names
MAX_ENUM_CHARS = 32        # strings that must be one of a few words (dtype, activation)

# JSON files (cards, IR graphs, HF config.json, checkpoint indexes and headers).
MAX_JSON_BYTES = 4 * 2**20         # an IR file of 512 distinct layers is ~2.3 MB
MAX_JSON_DEPTH = 32                # the deepest valid document nests 8 levels
MAX_JSON_STRING = 65_536           # characters of one string (key or value)
MAX_ECHO_CHARS = 80                # characters of a value echoed in an error

# safetensors checkpoints.
# A header lists each tensor in ~100 bytes: published shards' headers are under
# 1 MB, and even DeepSeek-V3 unsharded (~94k tensors) would need ~12 MB. Checked
# before the header is read; parsing one of this size takes a few seconds and
# ~300 MB (the format's own 100 MB limit cost 31 s and 1.4 GB).
MAX_SAFETENSORS_HEADER = 16 * 2**20
MAX_TENSOR_RANK = 8
MAX_SHARDS = 4096
