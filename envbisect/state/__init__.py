"""State: snapshot types, the local store, deltas between two snapshots, and target configurations."""
