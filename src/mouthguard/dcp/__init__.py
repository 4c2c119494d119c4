"""``torch.distributed.checkpoint`` storage plugins: DCP saves and loads through mouthguard.

::

    import torch.distributed.checkpoint as dcp
    from mouthguard import dcp as mgdcp

    dcp.save(state_dict, storage_writer=mgdcp.Writer(store, run="r", step=100))
    dcp.load(state_dict, storage_reader=mgdcp.Reader(store, run="r"))   # newest valid

A DCP checkpoint is an ordinary mouthguard checkpoint -- one safetensors rank
file per rank and ``manifest.json`` written last -- whose manifest carries DCP's
metadata as explicit JSON (never pickle) with a checksum per stored chunk, so
``Checkpointer.list``/``info``, ``mouthguard verify``, replication and retention
treat it like any other, and a resharded load verifies every byte it reads.
"""

from mouthguard.dcp.metadata_json import StoredItem, decode_metadata, encode_metadata
from mouthguard.dcp.reader import Reader
from mouthguard.dcp.writer import Writer

__all__ = ["Reader", "StoredItem", "Writer", "decode_metadata", "encode_metadata"]
