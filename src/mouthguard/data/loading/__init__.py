"""The torch side: the streaming dataset and its DataLoader.

:mod:`.stream` (``StreamingDataset``), :mod:`.loader` (``StreamingDataLoader``), the
epoch order and partitioning (:mod:`.order`), the saved position (:mod:`.position`),
and what the workers' fork server preloads (:mod:`.worker_preload`).
"""
