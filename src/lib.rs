pub mod config;
pub mod storage;
