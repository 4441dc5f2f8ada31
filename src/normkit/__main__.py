from normkit.cli import main

raise SystemExit(main())
