"""Qwen's facts, stated once: added-token ids per flavour, the tokens that matter, embedding rows.

One byte-level BPE serves Qwen2, 2.5 and 3; the flavours differ only in their added tokens, which
start at 151643: qwen2 has 3, qwen2.5 22 (to 151664), qwen3 26 (adds `<tool_response>`,
`</tool_response>`, `<think>`, `</think>`).
"""

FIRST_ADDED_ID = 151643
# Byte-level BPE's alphabet (the vocabulary's pieces are written in it): each byte stands as one printable
# character, the printable Latin-1 bytes as themselves, the others as 256, 257, ... in byte order.
PRINTABLE_BYTES = (*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1))
BYTE_OF_CHAR = {**{chr(b): b for b in PRINTABLE_BYTES},
                **{chr(256 + n): b for n, b in enumerate(b for b in range(256) if b not in PRINTABLE_BYTES)}}
FLAVOUR_ADDED_TOKENS = {"qwen2": 3, "qwen2.5": 22, "qwen3": 26}
# The flavour each chat template tokenizes with: a Qwen2.5 tokenizer has no <think> token.
TEMPLATE_FLAVOURS = {"qwen2": "qwen2", "qwen2p5": "qwen2.5", "qwen3": "qwen3"}

EOD_TOKEN = "<|endoftext|>"  # 151643: end of document in pretraining, whatever eos says
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Their ids in every flavour: the first added tokens, in this order.
EOD_ID, IM_START_ID, IM_END_ID = FIRST_ADDED_ID, FIRST_ADDED_ID + 1, FIRST_ADDED_ID + 2

# Padding must never be the end-of-document/eos/<|im_end|> id, or readers that mask "pad" by id
# also mask the real end of text and the model never learns to stop. <|vision_pad|> is inside every
# Qwen embedding table and never occurs in text data (pipelines reject data that would produce it).
DEFAULT_PAD_TOKEN = "<|vision_pad|>"
DEFAULT_PAD_ID = 151654

# Added tokens that chat content legitimately holds (tool calls written inline, Qwen3 reasoning and
# tool responses); the rest of a flavour's added tokens are structural.
CONTENT_TOKENS = frozenset({"<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"})
# Tokens the chat templates themselves write: a pad among them would collide with real data.
TEMPLATE_TOKENS = (EOD_TOKEN, IM_START, IM_END) + tuple(sorted(CONTENT_TOKENS))

# The longest sample or packed row qwen-data writes: 4 Mi tokens, four times the longest Qwen context
# (Qwen2.5-1M's 1,010,000 positions). What is beyond it is a typo, not a model: a row is allocated
# whole, so --seq-length 2,000,000,000 held 17.7 GB and wrote 10 GB of padding for 17 KB of tokens.
# A Pai row of 2 x this still fits an .idx length (int32).
LONGEST_CONTEXT = 1_010_000
MAX_SEQ_LENGTH = 1 << 22

# Embedding rows (the padded vocabulary): Qwen2.5 0.5B-3B and every Qwen3; Qwen2/2.5 7B-72B.
EMBEDDING_ROWS_SMALL = 151_936
EMBEDDING_ROWS_LARGE = 152_064
