//! Hands the directory of the hv's compiled test kernels to the targets:
//! the exit-handler target boots `hostile-exits.elf`
//! (crates/hv/tests/guests/hostile/exits.c), built by the hv's build script.

fn main() {
    let dir = std::env::var("DEP_FAULTLINE_HV_TEST_KERNELS_DIR")
        .expect("the hv's build script exports its test kernels' directory");
    println!("cargo:rustc-env=HV_TEST_KERNELS={dir}");
}
