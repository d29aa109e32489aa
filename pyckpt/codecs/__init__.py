"""Codecs of other checkpoint formats: how their bytes are read (each a
``CheckpointSource``, registered in ``pyckpt.sources``) and written. safetensors
(``safetensors.py``) and TensorFlow's TensorBundle (``tensorflow/``). The
conversions between them and pyckpt checkpoints are ``pyckpt.interop``'s.
"""
