// Placeholder entry point; replaced by the CLI in launch/.
int main() { return 0; }
