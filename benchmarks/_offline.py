"""Imported first by the benchmarks that start LiteLLM: this machine is offline, so LiteLLM reads its bundled model
cost map instead of trying the network (three tries, seconds each, at every start), and Hugging Face reads only its
local cache. A value already set in the environment wins."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
