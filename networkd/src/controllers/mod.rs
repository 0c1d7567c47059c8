//! networkd's controllers.
