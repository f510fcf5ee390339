//! The deterministic simulation.
//!
//! Owns (as later work lands): turmoil scenarios (`scenario`), fault schedules
//! (`fault`), the bound checker (`checker`, one function per bound of the
//! spec) and reports (`report`). Runs the real allocator and agent code.
//!
//! Nothing is implemented here yet; see the open simulation issue.
