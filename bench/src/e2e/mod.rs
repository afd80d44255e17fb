//! The end-to-end benchmark lab (`cargo xtask bench e2e` and its smoke
//! test): a live-frames generator in one namespace, the receiver under test
//! in another, and the scenarios compared on it.

pub mod lab;
pub mod measure;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod traffic;
