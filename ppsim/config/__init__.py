"""The config: typed sections, loading, presets, validation and the limits of a request."""
