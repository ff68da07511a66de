"""Caracal inside other libraries. `caracal.integrations.transformers` makes it a Hugging Face
transformers experts implementation (transformers is an optional dependency: `pip install
caracal[transformers]`)."""
