"""The API's routes, one APIRouter per resource; app.py includes them in this order."""
