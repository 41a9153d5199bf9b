#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| throttlewatch_fuzz_cases::spec_modifiers(data));
