"""``solar infer``: a verified checkpoint's weights through the generation path into ``generation/``."""
