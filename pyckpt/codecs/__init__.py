"""Codecs of other checkpoint formats: how their bytes are read (each a
``CheckpointSource``, registered in ``pyckpt.sources``) and written. safetensors
(``safetensors.py``, ``hf_folder.py``), TensorFlow's TensorBundle (``tensorflow/``)
and torch DCP's own directories (``distcp/``); ``record_file.py`` reads their small
record files with a size bound. The conversions between them and pyckpt checkpoints
are ``pyckpt.interop``'s.
"""
