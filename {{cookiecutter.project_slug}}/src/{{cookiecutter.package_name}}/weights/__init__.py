"""Where a model's tensors come from and go to, one tensor at a time: built without memory,
initialized by module, pretrained safetensors read by byte range (a `save_pretrained` folder,
the Hugging Face cache or `gs://`), exported by tensor."""
