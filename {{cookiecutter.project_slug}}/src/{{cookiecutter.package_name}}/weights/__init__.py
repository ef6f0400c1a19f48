"""Where a model's tensors come from and go to: pretrained safetensors read by byte range, shard
by shard, from a `save_pretrained` folder, the Hugging Face cache or `gs://`."""
