"""The local tier: each rank's newest steps in node-local tmpfs files (see docs/design.md)."""
