"""One-line plug-ins for the trainers people run.

* :mod:`mouthguard.integrations.lightning`: a PyTorch Lightning ``CheckpointIO``
  (``pip install 'mouthguard[lightning]'``).
* :mod:`mouthguard.integrations.hf`: a Hugging Face ``Trainer`` callback and
  ``restore`` (``pip install 'mouthguard[hf]'``).

Nothing here is imported by ``import mouthguard``: each module imports its
framework, which only its users have installed. torchtitan and NeMo need no
module of their own (see ``docs/integrations.md``).
"""
