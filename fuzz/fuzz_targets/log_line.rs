#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| throttlewatch_fuzz_cases::log_line(data));
