"""multilora: offline batch LLM inference over many LoRA adapters on one shared base model."""

__version__ = "0.1.0"
