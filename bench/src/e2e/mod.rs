//! The end-to-end benchmark lab (`cargo xtask bench e2e` and its smoke
//! test): a live-frames generator in one namespace, the receiver under test
//! in another, and the scenarios compared on it; and the service scenario
//! (a real web server and its clients under a spoofed SYN flood).

pub mod lab;
pub mod measure;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod service;
pub mod traffic;
