"""ActiveKV reference connector: the readable definition of what the native
engine must do bit for bit. Used for parity and the tests only; never released."""

from .connector import ActiveKVReferenceConnector
from .config import ActiveKVConfig, ConfigError, Error
from .layout import UnsupportedLayoutError

__all__ = ["ActiveKVConfig", "ActiveKVReferenceConnector", "ConfigError", "Error", "UnsupportedLayoutError"]
