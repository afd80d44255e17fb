//! The daemon's lists and bans in a netns lab, and their feeds.
