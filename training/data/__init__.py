"""The data stage (``suffice data``, ``suffice weak``): the one :class:`Item` schema, one reader per
file format, retrieval-gate threads, constructed variants, weak pairs, splits and the prepared-dataset builder.

Modules: ``schema`` (Item, Passage, DataFormatError), ``records`` (located record reading shared by the
readers), ``formats`` (one parser per QA format), ``loaders`` (``load_items`` and the gold/label readers),
``threads`` (retrieval-gate threads: the validated reader, training rows, export items), ``splits``
(``hash_split``), ``variants``, ``weak``, ``builder`` (``prepare``/``build``) and ``cli`` (``suffice data``).
"""
