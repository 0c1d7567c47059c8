//! The only code that speaks rtnetlink.
