"""Getting verified bytes to a reader: the shard cache, downloads, ranges, prefetch.

The bounded shared shard cache (:mod:`.cache`, its file primitives in
:mod:`.cachefiles`), downloads of shards and byte ranges (:mod:`.fetch`,
:mod:`.ranged`), a shard handed out range by range as each range verifies
(:mod:`.streamed`, :mod:`.rangefetch`, :mod:`.nodeslots`, :mod:`.follow`), files
verified where they lie (:mod:`.verified`, :mod:`.scratch`), and :mod:`.prefetch`.
"""
