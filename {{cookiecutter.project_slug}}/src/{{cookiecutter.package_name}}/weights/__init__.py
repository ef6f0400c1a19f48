"""Where a model's tensors come from and go to, one tensor at a time: built without memory,
initialized by module, pretrained safetensors read by byte range, exported by tensor."""
