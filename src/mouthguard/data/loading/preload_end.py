"""The fork server's last preload: forget the main module it imported by name.

Imported only by the dataset workers' fork server, after every other preload
(:func:`~mouthguard.data.loading.loader.fork_server`); see
:mod:`~mouthguard.data.loading.forget_main`. Nothing else imports it: it acts at import.
"""

from __future__ import annotations

from mouthguard.data.loading.forget_main import forget_preloaded_main

forget_preloaded_main()
