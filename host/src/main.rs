fn main() -> anyhow::Result<()> {
    smallrl::cli::main()
}
